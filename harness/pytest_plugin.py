"""pytest plugin (entry point ``pytest11``): cutbench as a CI gate. Extended in harness/gate."""
