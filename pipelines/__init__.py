"""The launch layer: entry points started on every rank, console scripts, ranks and launchers."""

# First, before any entry point's (heavy) imports: under a launcher, this rank dies with it.
from pipelines.parent_death import die_with_launcher

die_with_launcher()
