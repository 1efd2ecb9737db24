"""The LTX-2 family: image-to-video and keyframe interpolation on Lightricks' LTX-2 under rectified flow,
through diffusers' own LTX-2 classes (video only; the audio branch frozen)."""
