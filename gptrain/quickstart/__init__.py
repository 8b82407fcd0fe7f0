"""The quickstart: an offline English corpus and the presets `scripts/quickstart.sh` trains."""
