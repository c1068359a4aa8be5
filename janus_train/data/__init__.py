"""The reader stage: cached (or live) samples into token ids, labels, frames and features; mixtures, held-out episodes and the prompt."""
