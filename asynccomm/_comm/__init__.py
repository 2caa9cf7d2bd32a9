"""The public communicator, its groups, objects and batches, hang diagnosis and the
runners."""
