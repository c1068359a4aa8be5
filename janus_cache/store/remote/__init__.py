"""Caches in S3-compatible object storage (AWS S3, Ceph RGW, MinIO, OSS, SeaweedFS), read in place.

A cache's location is parsed once, at the command line, into a local :class:`~pathlib.Path` or an
:class:`~janus_cache.store.remote.path.S3Path` (``s3://BUCKET/PREFIX``,
:func:`janus_cache.store.location.cache_location`), and passed on as that type. The store's readers
take either: an ``S3Path`` reads like a read-only ``pathlib.Path`` (metadata, commit records,
checksums: the same code checks both), zarr reads its arrays through zarr-python 3's
``ObjectStore`` over obstore's ``S3Store`` (:mod:`.zarr_store`: each shard's index kept once per
process, a missing chunk an error), and webdataset streams ``s3://`` tars through the handler
:mod:`.wds` registers in its URL schemes.

* :mod:`.config`: the endpoint, region and credentials, read from the standard AWS variables and
  files (``AWS_PROFILE``, ``~/.aws/config``) through botocore, as every AWS tool reads them.
* :mod:`.client`: one obstore ``S3Store`` per bucket and process.
* :mod:`.errors`: each failure of the bucket (no or wrong credentials, a missing bucket, an
  endpoint that is down, a dropped connection) as one line.
* :mod:`.path`, :mod:`.zarr_store`, :mod:`.wds`: the read side.
* :mod:`.lock`: one writer per prefix, a lock object made with a conditional create.

obstore is imported only when a bucket is first read (the ``s3`` extra: ``pip install -e .[s3]``).
Copying a cache to and from a bucket is :mod:`janus_cache.transfer` (``janus-cache push`` / ``pull``).
"""
