"""Launch environments: hostfiles, the DeepSpeed and torchrun launchers, and `framer-ds env`."""
