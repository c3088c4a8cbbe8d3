from __future__ import annotations

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
application = get_wsgi_application()

from console.checks import refuse_known_secrets  # noqa: E402 (needs the settings configured above)

refuse_known_secrets()
