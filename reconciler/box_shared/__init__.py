"""Code both box programs carry (stdlib only). Each program imports it; on a box it is part of
the program's own text (reconciler/box_program.py)."""
