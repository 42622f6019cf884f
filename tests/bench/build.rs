// The benchmark measures the operator's memory in its own executable: it is linked the
// way `cro` is (packed relocations where the C library loads them).
include!("../../host/cli/build.rs");
