// The tools an agent's model is offered, with their argument schemas (GET /v1/agents/{id}/tools),
// read once per agent and kept for the page's life; a change of the agent (agent.updated@v1)
// drops its entry so that the next reader asks again.
import {useEffect, useState} from 'preact/hooks';
import {errorText, get, seg, type Tool} from './api';

export type AgentTools = {
  state: 'loading'
}|{
  state: 'ok';
  tools: Tool[]
}
|{
  state: 'error';
  error: string
};

const cache = new Map<string, Promise<Tool[]>>();
const listeners = new Set<(agentId: string) => void>();

function load(agentId: string): Promise<Tool[]> {
  let p = cache.get(agentId);
  if (!p) {
    p = get<{items: Tool[]}>(`/v1/agents/${seg(agentId)}/tools`).then((r) => r.items);
    cache.set(agentId, p);
    // A failed read is not kept: the next reader tries again.
    p.catch(() => {
      if (cache.get(agentId) === p) cache.delete(agentId);
    });
  }
  return p;
}

export function forgetAgentTools(agentId: string): void {
  if (!cache.delete(agentId)) return;
  for (const fn of listeners) fn(agentId);
}

// `agentId` null: nothing is read (state stays loading).
export function useAgentTools(agentId: string|null): AgentTools {
  const [state, setState] = useState<AgentTools>({state: 'loading'});
  const [version, setVersion] = useState(0);
  useEffect(() => {
    if (!agentId) return;
    const on = (id: string) => id === agentId && setVersion((n) => n + 1);
    listeners.add(on);
    return () => {
      listeners.delete(on);
    };
  }, [agentId]);
  useEffect(() => {
    if (!agentId) return;
    let live = true;
    load(agentId)
        .then((tools) => live && setState({state: 'ok', tools}))
        .catch((e) => live && setState({state: 'error', error: errorText(e)}));
    return () => {
      live = false;
    };
  }, [agentId, version]);
  return state;
}
