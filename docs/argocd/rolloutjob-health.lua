-- Argo CD health check for floe.dev/RolloutJob (resource.customizations.health.floe.dev_RolloutJob).
-- Reads only status: the operator's conditions (kstatus-style) and observedGeneration.
-- Written for Argo CD's gopher-lua (Lua 5.1); tested with Lua 5.4 as well.
local hs = {}
local function condition(status, kind)
  if status == nil or status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == kind then
      return c
    end
  end
  return nil
end
local function isTrue(c)
  return c ~= nil and c.status == "True"
end

local status = obj.status
if status == nil or status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the floe operator to pick up the job"
  return hs
end
if obj.metadata ~= nil and obj.metadata.generation ~= nil and status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the floe operator to observe generation " .. tostring(obj.metadata.generation)
  return hs
end

local failed = condition(status, "Failed")
local stalled = condition(status, "Stalled")
local complete = condition(status, "Complete")
local suspended = condition(status, "Suspended")
local ready = condition(status, "Ready")
if isTrue(failed) then
  hs.status = "Degraded"
  hs.message = failed.reason .. ": " .. (failed.message or "")
elseif isTrue(stalled) then
  hs.status = "Degraded"
  hs.message = stalled.reason .. ": " .. (stalled.message or "")
elseif isTrue(complete) then
  hs.status = "Healthy"
  hs.message = complete.message or "All sessions finished"
elseif isTrue(suspended) then
  hs.status = "Suspended"
  hs.message = suspended.message or "Suspended"
else
  hs.status = "Progressing"
  if ready ~= nil and ready.message ~= nil and ready.message ~= "" then
    hs.message = ready.message
  elseif status.progress ~= nil then
    hs.message = "Sessions " .. status.progress
  else
    hs.message = "Sessions running"
  end
end
return hs
