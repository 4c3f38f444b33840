"""`agnews distill`: a teacher labels unlabelled files on the batch path, a student learns its scores (training's own
loop), and the run records how far the student agrees with its teacher on texts it never saw."""
