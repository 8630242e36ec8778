// Who the page is signed in as (GET /v1/dashboard/session): its role and whether it is the
// platform admin's. Pages read it to leave out what the API would refuse this token (a refused
// request shows as an error in the browser's console).
import {createContext} from 'preact';
import {useContext} from 'preact/hooks';

export interface Who {
  role: string;  // owner | user | guest
  platformAdmin: boolean;
}

export const WhoContext = createContext<Who>({role: 'guest', platformAdmin: false});

export function useWho(): Who {
  return useContext(WhoContext);
}

// Owners change agents, policies, budgets, plugins, skills and decide approvals.
export const isOwner = (w: Who) => w.role === 'owner';
// Owners and users read approvals, schedules, usage, policies, plugins, skills, MCP servers.
export const isMember = (w: Who) => w.role === 'owner' || w.role === 'user';
