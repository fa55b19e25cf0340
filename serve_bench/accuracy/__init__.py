"""How accurate a deployed file is, from the answers it gave: top-k and its intervals, a detector's mAP,
the per-image predictions kept beside a report, and the same file's answers on two runtimes."""
