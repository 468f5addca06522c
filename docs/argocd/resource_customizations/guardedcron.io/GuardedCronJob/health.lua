-- Argo CD health check for guardedcron.io/GuardedCronJob.
--
-- Healthy:     the operator has seen the current generation and Ready is True.
-- Degraded:    Invalid, Stalled, Degraded, MissedRun or Overlap is True (current generation).
-- Suspended:   healthy otherwise, but spec.suspend is true.
-- Progressing: anything else, above all a status older than the spec.
--
-- Written for Lua 5.1 (gopher-lua, as in Argo CD).
local hs = {}

local function find_condition(conditions, wanted)
  if conditions == nil then
    return nil
  end
  for _, condition in ipairs(conditions) do
    if condition.type == wanted then
      return condition
    end
  end
  return nil
end

local function describe(condition)
  local text = condition.type
  if condition.reason ~= nil and condition.reason ~= "" then
    text = text .. " (" .. condition.reason .. ")"
  end
  if condition.message ~= nil and condition.message ~= "" then
    text = text .. ": " .. condition.message
  end
  return text
end

local status = obj.status
local generation = obj.metadata.generation
if status == nil or status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the guardedcron operator to reconcile this GuardedCronJob"
  return hs
end
if generation ~= nil and status.observedGeneration < generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the operator to reconcile generation " .. generation ..
    " (status is from generation " .. status.observedGeneration .. ")"
  return hs
end

-- Problems first: a failing object is never reported as healthy.
for _, kind in ipairs({"Invalid", "Stalled", "Degraded", "Overlap", "MissedRun"}) do
  local condition = find_condition(status.conditions, kind)
  if condition ~= nil and condition.status == "True" then
    hs.status = "Degraded"
    hs.message = describe(condition)
    return hs
  end
end

local ready = find_condition(status.conditions, "Ready")
if ready ~= nil and ready.status == "True" then
  if obj.spec ~= nil and obj.spec.suspend == true then
    hs.status = "Suspended"
    hs.message = "Suspended: no new runs are scheduled"
    return hs
  end
  hs.status = "Healthy"
  hs.message = describe(ready)
  return hs
end

hs.status = "Progressing"
if ready ~= nil then
  hs.message = describe(ready)
else
  hs.message = "Waiting for the Ready condition"
end
return hs
