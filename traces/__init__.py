"""Traffic: synthetic request generators and readers for public serving traces."""
