-- Argo CD health check for floe.dev/GatewayPool (resource.customizations.health.floe.dev_GatewayPool).
-- Healthy when the pool holds its READY replicas (the Ready condition), Progressing while it
-- warms or before the operator observed the current generation, Degraded when a Stalled
-- condition says it cannot make progress without a change.
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

local status = obj.status
if status == nil or status.observedGeneration == nil then
  hs.status = "Progressing"
  hs.message = "Waiting for the floe operator to pick up the pool"
  return hs
end
if obj.metadata ~= nil and obj.metadata.generation ~= nil and status.observedGeneration < obj.metadata.generation then
  hs.status = "Progressing"
  hs.message = "Waiting for the floe operator to observe generation " .. tostring(obj.metadata.generation)
  return hs
end
local stalled = condition(status, "Stalled")
if stalled ~= nil and stalled.status == "True" then
  hs.status = "Degraded"
  hs.message = stalled.reason .. ": " .. (stalled.message or "")
  return hs
end
local ready = condition(status, "Ready")
if ready ~= nil and ready.status == "True" then
  hs.status = "Healthy"
else
  hs.status = "Progressing"
end
if ready ~= nil and ready.message ~= nil then
  hs.message = ready.message
else
  hs.message = tostring(status.readyReplicas or 0) .. " pods READY"
end
return hs
