"""The scaling study: a resumable sweep into one tidy CSV, and figures made from it."""
