/**
 * What the kernel's cell monitor asks of the lab extension. The kernel knows neither the
 * server's URL nor its XSRF token, so its TensorBoard button is an element carrying the
 * job id (`data-mlcluster-tensorboard`); the extension turns a click on it into the
 * `mlcluster:open-tensorboard` command, as the sidebar's button does.
 */

export const TENSORBOARD_ATTRIBUTE = 'data-mlcluster-tensorboard';

/** Job ids as the server writes them (patterns.JOB_REF): nothing else reaches a command. */
const JOB_ID = /^[a-z0-9][a-z0-9-]{0,62}$/;

/** The job id a monitor's TensorBoard button names, or null for anything else. */
export function tensorBoardJobId(
  value: string | null | undefined
): string | null {
  return typeof value === 'string' && JOB_ID.test(value) ? value : null;
}
