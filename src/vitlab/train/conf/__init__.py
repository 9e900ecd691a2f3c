"""WHAT a training run is, without torch: the option table (:mod:`.options`) and the argparse parser generated
from it (:mod:`.parser`), the configuration and config files (:mod:`.config`, :mod:`.files`), the recipes
(:mod:`.recipes`), the architecture rule (:mod:`.arch`), every validation (:mod:`.rules`), what ``--resume`` may
change (:mod:`.resume`) and the recipe fitted to the data (:mod:`.fitting`)."""
