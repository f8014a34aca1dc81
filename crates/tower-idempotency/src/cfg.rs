//! The feature lists more than one module is compiled under, written once (tokio's `cfg_*!`
//! macros).

/// Items compiled with any of the stores: the memory store or a database's.
macro_rules! cfg_any_store {
    ($($item:item)*) => {
        $(
            #[cfg(any(feature = "memory", feature = "postgres", feature = "sqlite", feature = "mysql", feature = "redis"))]
            $item
        )*
    };
}
