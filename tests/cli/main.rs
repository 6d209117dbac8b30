//! The commands as a person meets them, and the rules the sources keep:
//! golden help and usage errors (tests/cmd), the man pages, the rules the
//! compiler cannot hold, the install lists, the benchmark's smoke run.  One
//! binary, a module per suite (its tests run on parallel threads).

mod bench_smoke;
mod cli_golden;
mod install_lists;
mod manpages;
mod source_rules;
