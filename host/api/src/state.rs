//! Lifecycle states of both kinds, as stored in `status.state`.
//!
//! The API server accepts any string there (the schema does not enumerate states), and an
//! object may have been written by another version of the operator, so parsing never fails:
//! an unrecognised string is kept verbatim in `Unknown` and written back unchanged.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! string_state {
    (
        $(#[$meta:meta])*
        $name:ident, $description:literal {
            $( $(#[$vmeta:meta])* $variant:ident => $text:literal, )+
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
        pub enum $name {
            /// The empty string: the object has not been acted on yet.
            #[default]
            Empty,
            $( $(#[$vmeta])* $variant, )+
            /// A state this version does not know, kept verbatim.
            Unknown(String),
        }

        impl $name {
            /// Every known state, in lifecycle order (without `Unknown`).
            pub const KNOWN: &'static [$name] = &[$name::Empty, $( $name::$variant, )+];

            /// The string stored in `status.state`.
            pub fn as_str(&self) -> &str {
                match self {
                    $name::Empty => "",
                    $( $name::$variant => $text, )+
                    $name::Unknown(s) => s,
                }
            }

            /// Parses a stored state; never fails (see the module documentation).
            pub fn parse(s: &str) -> Self {
                match s {
                    "" => $name::Empty,
                    $( $text => $name::$variant, )+
                    other => $name::Unknown(other.to_owned()),
                }
            }

            /// Whether this is a state this version knows.
            pub fn is_known(&self) -> bool {
                !matches!(self, $name::Unknown(_))
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self::parse(s)
            }
        }

        impl From<String> for $name {
            fn from(s: String) -> Self {
                match Self::parse(&s) {
                    $name::Unknown(_) => $name::Unknown(s),
                    known => known,
                }
            }
        }

        impl From<$name> for String {
            fn from(s: $name) -> Self {
                match s {
                    $name::Unknown(s) => s,
                    known => known.as_str().to_owned(),
                }
            }
        }

        impl std::str::FromStr for $name {
            type Err = std::convert::Infallible;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Ok(Self::parse(s))
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                // null is what a client that dropped the field would send; treat it as "".
                let s = Option::<String>::deserialize(deserializer)?;
                Ok(s.map(Self::from).unwrap_or_default())
            }
        }

        impl JsonSchema for $name {
            fn inline_schema() -> bool {
                true
            }

            fn schema_name() -> Cow<'static, str> {
                stringify!($name).into()
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({
                    "type": "string",
                    "description": $description,
                })
            }
        }
    };
}

string_state! {
    /// State of a ComposabilityRequest (docs/behaviour.md §3).
    RequestState,
    "Lifecycle state: \"\", NodeAllocating, Updating, Running, Cleaning or Deleting." {
        /// Deciding which devices to keep and where new ones go.
        NodeAllocating => "NodeAllocating",
        /// Creating and deleting ComposableResources until all are Online.
        Updating => "Updating",
        /// Every device of the request is Online.
        Running => "Running",
        /// Being deleted: waiting until all its ComposableResources are gone.
        Cleaning => "Cleaning",
        /// All resources gone; the finalizer is being removed.
        Deleting => "Deleting",
    }
}

string_state! {
    /// State of a ComposableResource (docs/behaviour.md §4).
    ResourceState,
    "Lifecycle state: \"\", Attaching, Online, Detaching or Deleting." {
        /// Asking the fabric for a device and waiting until the node sees it.
        Attaching => "Attaching",
        /// The device is attached and visible on the node.
        Online => "Online",
        /// Draining and detaching the device.
        Detaching => "Detaching",
        /// The device is released; the finalizer is being removed.
        Deleting => "Deleting",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_states_round_trip_through_strings_and_json() {
        for state in RequestState::KNOWN {
            assert_eq!(&RequestState::parse(state.as_str()), state);
            let json = serde_json::to_string(state).unwrap();
            assert_eq!(&serde_json::from_str::<RequestState>(&json).unwrap(), state);
            assert!(state.is_known());
        }
        for state in ResourceState::KNOWN {
            assert_eq!(&ResourceState::parse(state.as_str()), state);
            assert_eq!(String::from(state.clone()), state.as_str());
            assert!(state.is_known());
        }
        assert_eq!(RequestState::KNOWN.len(), 6);
        assert_eq!(ResourceState::KNOWN.len(), 5);
    }

    #[test]
    fn unknown_states_are_kept_verbatim() {
        let s: ResourceState = serde_json::from_str("\"Exploding\"").unwrap();
        assert_eq!(s, ResourceState::Unknown("Exploding".into()));
        assert!(!s.is_known());
        assert_eq!(serde_json::to_string(&s).unwrap(), "\"Exploding\"");
        // Case matters: the Go operator writes exactly "Online".
        assert_eq!(
            ResourceState::parse("online"),
            ResourceState::Unknown("online".into())
        );
        assert_eq!(
            RequestState::from(String::from("Running")),
            RequestState::Running
        );
        assert_eq!(
            "Cleaning".parse::<RequestState>().unwrap(),
            RequestState::Cleaning
        );
    }

    #[test]
    fn empty_and_null_mean_the_initial_state() {
        assert_eq!(
            serde_json::from_str::<RequestState>("\"\"").unwrap(),
            RequestState::Empty
        );
        assert_eq!(
            serde_json::from_str::<RequestState>("null").unwrap(),
            RequestState::Empty
        );
        assert_eq!(RequestState::default().to_string(), "");
        assert!(serde_json::from_str::<RequestState>("3").is_err());
    }

    #[test]
    fn schema_is_an_open_string() {
        let schema = schemars::schema_for!(ResourceState);
        assert_eq!(schema.get("type").unwrap(), "string");
        assert!(schema.get("enum").is_none());
    }
}
