"""Point-cloud file formats: detection, safe readers (bin/npy/PCD/PLY), open3d backend, local discovery."""
