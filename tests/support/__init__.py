"""Test doubles shared by the tests and the benchmarks, kept out of the shipped packages."""
