package outbox

const RecoveryPagesPerRunMax = recoveryPagesPerRunMax
