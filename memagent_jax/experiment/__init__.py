"""The assembly: a config turned into the parts of a run, once, for every entry point."""
