"""What a new user meets first: each wrong setting or missing piece answered by one line that says what to do."""
