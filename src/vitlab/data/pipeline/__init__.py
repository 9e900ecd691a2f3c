"""The input pipeline from stored pixels to batches: the transforms, per-sample seeding, the DataLoader's
failures, and NaViT's images at their own aspect ratio packed into sequences."""
