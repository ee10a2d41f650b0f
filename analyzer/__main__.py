"""``python -m analyzer``: the tracecliff command line."""

from analyzer.cli.main import console

if __name__ == "__main__":
    console()
