//! Fixture: a component of an unrelated world (`acme:other/other`), for the host's
//! "not a provider" check.

#[cfg(target_arch = "wasm32")]
mod guest {
    wit_bindgen::generate!({
        inline: "
            package acme:other@1.0.0;

            world other {
                export greet: func() -> string;
            }
        ",
        world: "acme:other/other@1.0.0",
    });

    struct Other;

    export!(Other);

    impl Guest for Other {
        fn greet() -> String {
            "hello from another world".into()
        }
    }
}
