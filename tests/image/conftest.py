"""The container contract tests run only when asked (`make image-test`, which builds the image first):
they need podman and the SemIf image, and take minutes. `make test` does not collect them."""
import os

if os.environ.get("SEMIF_IMAGE_TEST") != "1":
    collect_ignore_glob = ["test_*.py"]
