"""A stand-in for verl's recipe/sppo/main_sppo.py: `rlplan import verl` reads only its @hydra.main arguments."""

import hydra


@hydra.main(config_path="config", config_name="sppo_trainer", version_base=None)
def main(config) -> None:
    raise SystemExit("a test stand-in for verl's SPPO entry point; it trains nothing")
