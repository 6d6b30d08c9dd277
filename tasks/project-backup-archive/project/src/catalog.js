not a log
