"""Fine-tuning: the commands, the loop's spine, and rooms for data, output, speed and scoring."""
