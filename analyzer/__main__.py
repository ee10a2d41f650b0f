from analyzer.cli.main import console

if __name__ == "__main__":
    console()
