import { LabIcon } from '@jupyterlab/ui-components';

/** Four nodes linked to a hub: a distributed job. Fill follows the theme's icon colour. */
const svgstr = `<svg xmlns="http://www.w3.org/2000/svg" width="16" height="16" viewBox="0 0 24 24">
  <g class="jp-icon3" fill="#616161">
    <path d="M11 6.9V10H6.9A3 3 0 1 0 6.9 12H11v3.1a3 3 0 1 0 2 0V12h4.1a3 3 0 1 0 0-2H13V6.9a3 3 0 1 0-2 0zM12 3a1 1 0 1 1 0 2 1 1 0 0 1 0-2zM4 10a1 1 0 1 1 0 2 1 1 0 0 1 0-2zm16 0a1 1 0 1 1 0 2 1 1 0 0 1 0-2zm-8 7a1 1 0 1 1 0 2 1 1 0 0 1 0-2z"/>
  </g>
</svg>`;

export const clusterIcon = new LabIcon({
  name: 'jupyterlab-mlcluster:cluster',
  svgstr
});
