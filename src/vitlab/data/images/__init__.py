"""The images of a folder, decoded once: the one decoder, the resize geometry, the folder walk, rows of an image
array, the files a user names, and how a run stores a folder's images."""
