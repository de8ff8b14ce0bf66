"""dgemm on batch systems: device workers as dask-jobqueue jobs, the recipes installed with the package.

* :mod:`dgemm.deploy.slurm`: SLURM (``sbatch``; one job per GPU node, ``--gres=gpu:G``);
* :mod:`dgemm.deploy.pbs`: PBS Pro / OpenPBS (``qsub``; ``-l select=1:ncpus=C:ngpus=G:mem=M``);
* :mod:`dgemm.deploy.jobqueue`: what the two share.

Each job runs ``dgemm worker`` (``python -m dgemm worker SCHEDULER --name ...
--nthreads ... --memory-limit ... --devices gpu``): one Dask worker per GPU
the batch system gave the job, pinned to it, advertising ``GPU=1`` and
carrying the dgemm worker plugin.  The scheduler runs where the cluster is
made (a login node), with dgemm's scheduler plugins preloaded.  The same from
the command line: ``dgemm jobqueue slurm ...`` and ``dgemm jobqueue pbs ...``.
dask-jobqueue is needed only when a cluster or a job script is made:
``pip install "dgemm[jobqueue]"``.

>>> from dgemm.deploy import slurm
>>> slurm.options(gpus_per_node=4, cores=32, memory="256GB", partition="gpu")["job_extra_directives"]
['--gres=gpu:4']
"""
