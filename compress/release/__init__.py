"""What ships: a release bundle made from a finished run (`compress release`) and its check (`compress verify`)."""
