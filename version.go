package fairlock

// Version is this release of fairlock: the version under which its
// modules (this one, fairlockrueidis, fairlockvalkey and fairlockotel) are
// tagged, and the newest release CHANGELOG.md names. The modules require
// one another at this version.
const Version = "v0.1.0"
