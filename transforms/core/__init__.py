"""The build core: settle and score the samples, plan each epoch, write the plan files and the record."""
