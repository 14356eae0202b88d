"""`preheat train`: the group that trains and registers the platform's models.

Each command lives beside the code it shares (`flows.cli.forecast`, `flows.cli.heat`,
`flows.cli.templates`); they are registered here, in the order `preheat train --help` lists them.
"""

from __future__ import annotations

import typer

from flows.cli.forecast import train_forecaster_command
from flows.cli.heat import train_heat_gan_command
from flows.cli.templates import train_templates_command

train = typer.Typer(help="Train and register the platform's models.", no_args_is_help=True)
train.command("forecaster")(train_forecaster_command)
train.command("heat-gan")(train_heat_gan_command)
train.command("templates")(train_templates_command)
