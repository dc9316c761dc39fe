"""MariaDB as the stack's second real source: its workload and the wait for its capture."""
