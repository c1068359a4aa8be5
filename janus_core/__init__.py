"""The shared domain both stages build on: profiles and settings, resolutions and windows, each base
model's facts, image processing, the dataset index, the frozen VGGT and ViT encoders, locks and
devices. It imports no cache I/O, ranks or trainer."""
