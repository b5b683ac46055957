-- Argo CD health check for kvcal.dev/KVCalibration.
-- Healthy: the calibrated checkpoint is promoted. Suspended: waiting for a manual promotion.
-- Degraded: rolled back, failed, or the spec is invalid. Progressing: any running phase, or the
-- operator has not yet seen the latest spec (status.observedGeneration < metadata.generation).
local hs = {}

local phases = {
  Pending = "Progressing",
  Calibrating = "Progressing",
  Verifying = "Progressing",
  Deploying = "Progressing",
  Analyzing = "Progressing",
  Promoting = "Progressing",
  RollingBack = "Progressing",
  AwaitingPromotion = "Suspended",
  Succeeded = "Healthy",
  RolledBack = "Degraded",
  Failed = "Degraded",
  InvalidSpec = "Degraded",
}

local function describe(status)
  local text = status.phase
  if status.message ~= nil and status.message ~= "" then
    text = text .. ": " .. status.message
  end
  if status.canary ~= nil and status.canary.weight ~= nil and status.canary.weight > 0 then
    text = text .. " (canary weight " .. tostring(status.canary.weight) .. "%)"
  end
  return text
end

if obj.status == nil or obj.status.phase == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the kvcal operator to pick up this KVCalibration"
  return hs
end

local status = obj.status
local generation = obj.metadata.generation
if generation ~= nil and (status.observedGeneration == nil or status.observedGeneration < generation) then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
  return hs
end

local mapped = phases[status.phase]
if mapped == nil then
  hs.status = "Unknown"
  hs.message = "Unknown phase " .. tostring(status.phase) .. ": update the kvcal health check"
  return hs
end
hs.status = mapped
hs.message = describe(status)
return hs
