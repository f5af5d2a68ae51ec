"""Tests of the benchmarks' own measuring (bench/): what a figure counts."""
