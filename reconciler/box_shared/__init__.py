"""Code a box program shares with the other one or with the controller (stdlib only, Python
>= 3.8). A program imports it; on a box it is part of the program's own text
(reconciler/box_program.py)."""
