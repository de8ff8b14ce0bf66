"""``python -m dgemm ...`` runs the command-line interface."""
from dgemm.cli import main

if __name__ == "__main__":
    main()
