"""One tick: read the windows, judge every run, write the verdicts; and the text a person reads."""
