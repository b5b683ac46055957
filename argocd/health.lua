-- Argo CD health check for kvcal.dev/KVCalibration.
-- Healthy: the calibrated checkpoint is promoted. Suspended: waiting for a manual promotion.
-- Degraded: rolled back, failed, or the spec is invalid; also while reconcile passes fail
-- (ReconcileError=True) or when a promoted checkpoint no longer verifies in the baseline's vLLM
-- (ServingVerified=False), or when a sync or a person reverted the promotion in the baseline
-- (Promoted=False in Succeeded). Progressing: any running phase, or the operator has not yet seen the
-- latest spec (status.observedGeneration < metadata.generation). A spec change after the run
-- ended (SpecCurrent=False) keeps the health and says how to recalibrate.
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

local function condition(type_)
  for _, c in ipairs(status.conditions or {}) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end

local failing = condition("ReconcileError")
local serving = condition("ServingVerified")
local current = condition("SpecCurrent")
local promoted = condition("Promoted")
if failing ~= nil and failing.status == "True" then
  hs.status = "Degraded"
  hs.message = "Reconcile failing: " .. tostring(failing.message) .. " (" .. hs.message .. ")"
elseif status.phase == "Succeeded" and promoted ~= nil and promoted.status == "False" then
  hs.status = "Degraded"
  hs.message = "Promotion reverted: " .. tostring(promoted.message)
elseif serving ~= nil and serving.status == "False" then
  hs.status = "Degraded"
  hs.message = tostring(serving.message)
elseif current ~= nil and current.status == "False" then
  hs.message = hs.message .. " (" .. tostring(current.message) .. ")"
end
return hs
