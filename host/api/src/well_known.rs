//! Names shared with the Go operator: API group, labels, annotations and the finalizer.
//!
//! They are part of the on-cluster contract (docs/behaviour.md §2): objects written by the Go operator
//! carry exactly these keys, so they must never change.

/// API group of both kinds.
pub const GROUP: &str = "cro.hpsys.ibm.ie.com";
/// API version of both kinds.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` of both kinds.
pub const API_VERSION: &str = "cro.hpsys.ibm.ie.com/v1alpha1";

/// Label on a ComposableResource naming the ComposabilityRequest it belongs to.
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";

/// The DRA driver name of the fabric's free devices cro publishes as ResourceSlices
/// (docs/dra.md); also the domain of their attributes.
pub const DRA_DRIVER: &str = "cro.hpsys.ibm.ie.com";
/// Label on a ComposableResource the binding controller made for a ResourceClaim: the
/// claim's UID.
pub const LABEL_CLAIM_UID: &str = "cro.hpsys.ibm.ie.com/claim-uid";
/// The label naming the provider whose pool a ResourceSlice publishes.
pub const LABEL_POOL_PROVIDER: &str = LABEL_PROVIDER;
/// Label on every Lease of the replicas' sharing of providers (a Lease per provider and
/// one per replica): the name of the deployment's leader Lease.
pub const LABEL_LEASES_OF: &str = "cro.hpsys.ibm.ie.com/leases-of";
/// The label naming the provider (`CdiProvider`, or `default`) that serves a
/// ComposableResource's node, set when the resource is made: the replica holding that
/// provider's Lease is the one that reconciles it (docs/ARCHITECTURE.md, "Replicas").
/// The same key names a ResourceSlice's provider.
pub const LABEL_PROVIDER: &str = "cro.hpsys.ibm.ie.com/provider";
/// The binding condition of a published device: set True on the claim once the device
/// is attached to the chosen node and visible there (the name CoHDI's driver uses).
pub const CONDITION_FABRIC_DEVICE_READY: &str = "FabricDeviceReady";
/// Binding failure conditions: the scheduler places the Pod again (CoHDI's names).
pub const CONDITION_FABRIC_DEVICE_RESCHEDULE: &str = "FabricDeviceReschedule";
pub const CONDITION_FABRIC_DEVICE_FAILED: &str = "FabricDeviceFailed";
/// Label on a ComposableResource created only to detach an orphaned device: the device id.
pub const LABEL_READY_TO_DETACH_DEVICE_ID: &str = "cohdi.io/ready-to-detach-device-id";
/// Label on a ComposableResource created only to detach an orphaned device: the fabric's id.
pub const LABEL_READY_TO_DETACH_CDI_DEVICE_ID: &str = "cohdi.io/ready-to-detach-cdi-device-id";

/// Annotation on a ComposableResource: when its device was last used (RFC 3339).
pub const ANNOTATION_LAST_USED_TIME: &str = "cohdi.io/last-used-time";
/// Annotation on a ComposableResource: `true` asks that this device be dropped first.
pub const ANNOTATION_DELETE_DEVICE: &str = "cohdi.io/delete-device";
/// The value of [`ANNOTATION_DELETE_DEVICE`] that marks a device for deletion.
pub const ANNOTATION_DELETE_DEVICE_TRUE: &str = "true";

/// Finalizer the operator keeps on both kinds until their devices are released.
pub const FINALIZER: &str = "com.ie.ibm.hpsys/finalizer";

// cro's own keys (the Go operator neither writes nor reads them; its CRD accepts them,
// since annotations are free-form).

/// Annotation on a ComposableResource: what named its node's fabric machine when the
/// device was attached (JSON: the Node's `providerID` and `machine.openshift.io/machine`),
/// so that the device can be detached after the Node is deleted.
pub const ANNOTATION_NODE_MACHINE: &str = "cro.hpsys.ibm.ie.com/node-machine";
/// Annotation an administrator sets on a ComposableResource whose node cannot run
/// commands: `true` makes its detach skip every node step and only detach on the fabric.
pub const ANNOTATION_SKIP_NODE_STEPS: &str = "cro.hpsys.ibm.ie.com/skip-node-steps";
