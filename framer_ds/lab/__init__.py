"""The strategy lab: measuring what a training strategy costs (memory, time) on this machine."""
