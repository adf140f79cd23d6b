/* Native ceilings for hixl-bench (placeholder until the benchmark lands). */
