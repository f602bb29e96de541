//! ecdedup's lab: the experiments that reproduce each paper on the real
//! engine ([`eval`]: parity dedup, block separation, CodePlugin), with their
//! reports and plots. Researchers run it through `ecdedup eval`; servers do
//! not link it.

pub mod eval;
