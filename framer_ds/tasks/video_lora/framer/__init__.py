"""Framer: SVD's family extended one way (`FramerFamily(SvdFamily)`): a 9-channel UNet with a mask token,
the trajectory ControlNet and its point tracks (`tracks/`), Framer's conditioning and exports."""
