"""The decode cache: image files decoded once into a memory-mapped uint8 array (store), what it will hold
(layout), its checks, the commands that list and clear caches, and the size cap."""
